"""synth.simulation.link_accounts and ``synth simulate --links``: each link's account adds up to the makespan."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synth import api
from synth.cli import cli
from synth.simulation import link_accounts, simulate


@pytest.mark.parametrize("topology, method", [("dgx1", "ring"), ("dgx-a100-2node", "railblocks")])
def test_accounts_add_up(topology, method):
    result = api.synthesize(topology, "allgather", "64MiB", method)
    fabric = api.load_topology(topology)
    sim = simulate(result.program, fabric)
    accounts = link_accounts(sim, fabric)
    assert {a.link for a in accounts} == {hop for *_, route in sim.events for hop in route}
    assert accounts[0].tail == pytest.approx(0.0, abs=1e-6)     # the link that ends last ends the program
    assert [a.tail for a in accounts] == sorted(a.tail for a in accounts)
    alpha = {f"{fabric.node_name(link.src)}->{fabric.node_name(link.dst)}": link.alpha for link in fabric.links}
    for a in accounts:
        held = [(start, end, route) for *_, start, end, route in sim.events if a.link in route]
        assert a.messages == len(held)
        assert a.busy == pytest.approx(sum(end - start for start, end, _ in held))
        assert a.alpha == pytest.approx(sum(sum(alpha[hop] for hop in route) for *_, route in held))
        assert 0 <= a.alpha <= a.busy + 1e-9
        # a link serves one transfer at a time, so its idle parts and its busy time fill the makespan
        assert a.head + a.busy + a.gaps + a.tail == pytest.approx(sim.time_us)


def test_a_switch_route_holds_every_link_with_its_alpha():
    # dgx-a100-2node's rails run rank -> NIC -> IB -> NIC -> rank: each link of such a message is charged the
    # whole route's α, which is what makes few, large network messages pay
    result = api.synthesize("dgx-a100-2node", "allgather", "64MiB", "railblocks")
    fabric = api.load_topology("dgx-a100-2node")
    sim = simulate(result.program, fabric)
    by_link = {a.link: a for a in link_accounts(sim, fabric)}
    routes = {route for *_, route in sim.events if len(route) > 2}
    route = min(routes)
    alphas = sum(link.alpha for link in fabric.links
                 if f"{fabric.node_name(link.src)}->{fabric.node_name(link.dst)}" in route)
    assert alphas > 0
    assert all(by_link[hop].alpha >= alphas - 1e-9 for hop in route)


def test_cli_links_table_and_json(tmp_path):
    result = api.synthesize("dgx1", "allgather", "1MiB", "ring")
    path = tmp_path / "ring.json"
    api.save_program(result.program, path)
    runner = CliRunner()
    shown = runner.invoke(cli, ["simulate", str(path), "--links", "3"])
    assert shown.exit_code == 0, shown.output
    assert "the 3 links that end last" in shown.output
    payload = json.loads(runner.invoke(cli, ["simulate", str(path), "--links", "3", "--json"]).output)
    assert len(payload["links"]) == 3
    expected = [a.to_dict() for a in link_accounts(simulate(result.program, api.load_topology("dgx1")),
                                                   api.load_topology("dgx1"))[:3]]
    assert payload["links"] == expected
    assert payload["time_us"] == pytest.approx(result.time_us)
    assert "links" not in json.loads(runner.invoke(cli, ["simulate", str(path), "--json"]).output)
    refused = runner.invoke(cli, ["simulate", str(path), "--links", "0"])
    assert refused.exit_code == 2
