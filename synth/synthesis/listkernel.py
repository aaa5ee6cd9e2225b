"""The event loop of :func:`synth.synthesis.timing.list_schedule`, compiled with numba.

Plain arrays in, plain arrays out: transfers, links and dependencies as CSR arrays, link queues
and the event queue as binary heaps in preallocated arrays. It makes the same choices as the
rule :func:`~synth.synthesis.timing.list_schedule` documents, float operation for float
operation, so a timing gives the same bytes whichever machine or load runs it. Every heap holds
distinct entries (key ranks, or (time, kind, id) triples whose duplicates are equal), so which
entry a pop returns does not depend on how the heap is laid out.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

EPS = 1e-12     # two instants this close are one (as in timing.list_schedule)
PICK_WIDTH = 8  # a blocked link looks this far down its queue for a transfer that can start


@njit(cache=True, inline="always")
def _event_less(times, kinds, ids, a, b):
    if times[a] != times[b]:
        return times[a] < times[b]
    if kinds[a] != kinds[b]:
        return kinds[a] < kinds[b]
    return ids[a] < ids[b]


@njit(cache=True, inline="always")
def _event_swap(times, kinds, ids, a, b):
    times[a], times[b] = times[b], times[a]
    kinds[a], kinds[b] = kinds[b], kinds[a]
    ids[a], ids[b] = ids[b], ids[a]


@njit(cache=True)
def _event_push(times, kinds, ids, size, t, kind, ident):
    """Push (t, kind, ident) on the event heap of ``size`` entries; returns the new size."""
    pos = size
    times[pos], kinds[pos], ids[pos] = t, kind, ident
    while pos > 0:
        parent = (pos - 1) >> 1
        if _event_less(times, kinds, ids, pos, parent):
            _event_swap(times, kinds, ids, pos, parent)
            pos = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _event_pop(times, kinds, ids, size):
    """Remove the least event (left at index ``size - 1``); returns the new size."""
    last = size - 1
    _event_swap(times, kinds, ids, 0, last)
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= last:
            break
        if child + 1 < last and _event_less(times, kinds, ids, child + 1, child):
            child += 1
        if _event_less(times, kinds, ids, child, pos):
            _event_swap(times, kinds, ids, pos, child)
            pos = child
        else:
            break
    return last


@njit(cache=True)
def _queue_push(store, base, size, value):
    """Push ``value`` on the int heap ``store[base:base + size]``; returns the new size."""
    pos = size
    store[base + pos] = value
    while pos > 0:
        parent = (pos - 1) >> 1
        if store[base + pos] < store[base + parent]:
            store[base + pos], store[base + parent] = store[base + parent], store[base + pos]
            pos = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _queue_pop(store, base, size):
    """Pop the least value of the int heap ``store[base:base + size]``; returns (value, new size)."""
    top = store[base]
    last = size - 1
    store[base] = store[base + last]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= last:
            break
        if child + 1 < last and store[base + child + 1] < store[base + child]:
            child += 1
        if store[base + child] < store[base + pos]:
            store[base + pos], store[base + child] = store[base + child], store[base + pos]
            pos = child
        else:
            break
    return top, last


@njit(cache=True)
def _route_free(hop_ptr, hop_link, free, job, t):
    """When every link of ``job``'s route is free, and not before ``t``."""
    s = t
    for h in range(hop_ptr[job], hop_ptr[job + 1]):
        if free[hop_link[h]] > s:
            s = free[hop_link[h]]
    return s


@njit(cache=True)
def list_kernel(num_links, hop_ptr, hop_link, dep_ptr, dep_idx, dnt_ptr, dnt_idx, rank_of, job_at,
                duration, route_alpha, route_rate, msg_size, chunk_bytes, max_step_chunks, max_coalesce,
                coalesce, alpha_share, has_drain, drain, data_time, batch, head_id, next_id, num_head_ids):
    """Returns (start, end, head, unplaced): per job its start, its end and the first job of its message,
    and how many jobs never became ready (some: the dependencies are cyclic)."""
    n = rank_of.shape[0]
    start = np.zeros(n)
    end = np.zeros(n)
    head = np.arange(n)
    taken = np.zeros(n, dtype=np.bool_)
    waiting = np.empty(n, dtype=np.int64)
    for i in range(n):
        waiting[i] = dep_ptr[i + 1] - dep_ptr[i]
    free = np.zeros(num_links)
    first_link = np.empty(n, dtype=np.int64)
    q_base = np.zeros(num_links + 1, dtype=np.int64)
    for i in range(n):
        first_link[i] = hop_link[hop_ptr[i]]
        q_base[first_link[i] + 1] += 1
    for link in range(num_links):
        q_base[link + 1] += q_base[link]
    q_size = np.zeros(num_links, dtype=np.int64)
    q_store = np.empty(max(n, 1), dtype=np.int64)
    by_first = np.full(max(num_head_ids, 1), -1, dtype=np.int64)
    left = np.zeros(num_links)
    if has_drain:
        for i in range(n):
            for h in range(hop_ptr[i], hop_ptr[i + 1]):
                left[hop_link[h]] += data_time[i]
    capacity = 3 * n + num_links + 1
    ev_t = np.empty(capacity)
    ev_k = np.empty(capacity, dtype=np.int64)
    ev_i = np.empty(capacity, dtype=np.int64)
    events = 0
    for i in range(n):
        if waiting[i] == 0:
            events = _event_push(ev_t, ev_k, ev_i, events, 0.0, 0, i)
    woken = np.zeros(num_links, dtype=np.bool_)
    woken_list = np.empty(num_links, dtype=np.int64)
    members = np.empty(max_coalesce + 1, dtype=np.int64)
    picked = np.empty(PICK_WIDTH, dtype=np.int64)
    while events > 0:
        events = _event_pop(ev_t, ev_k, ev_i, events)
        t, kind, ident = ev_t[events], ev_k[events], ev_i[events]
        if kind == 0:
            link = first_link[ident]
            q_size[link] = _queue_push(q_store, q_base[link], q_size[link], rank_of[ident])
            if coalesce:
                by_first[head_id[ident]] = ident
                if batch:
                    num_woken = 0
                    while events > 0 and ev_k[0] == 0 and ev_t[0] <= t + EPS:
                        events = _event_pop(ev_t, ev_k, ev_i, events)
                        other = ev_i[events]
                        other_link = first_link[other]
                        q_size[other_link] = _queue_push(q_store, q_base[other_link], q_size[other_link],
                                                         rank_of[other])
                        by_first[head_id[other]] = other
                        if not woken[other_link]:
                            woken[other_link] = True
                            woken_list[num_woken] = other_link
                            num_woken += 1
                    for w in range(num_woken):
                        other_link = woken_list[w]
                        woken[other_link] = False
                        if other_link != link:
                            events = _event_push(ev_t, ev_k, ev_i, events, t, 1, other_link)
        else:
            link = ident
        base = q_base[link]
        while q_size[link] > 0 and taken[job_at[q_store[base]]]:
            _, q_size[link] = _queue_pop(q_store, base, q_size[link])
        if q_size[link] == 0 or free[link] > t + EPS:
            continue
        i = job_at[q_store[base]]
        s = _route_free(hop_ptr, hop_link, free, i, t)
        if s <= t:
            _, q_size[link] = _queue_pop(q_store, base, q_size[link])
        else:
            # the best-keyed transfers, up to PICK_WIDTH, until one can start now: the first that starts soonest
            count = 0
            best = -1
            best_s = 0.0
            while q_size[link] > 0 and count < PICK_WIDTH:
                item, q_size[link] = _queue_pop(q_store, base, q_size[link])
                job = job_at[item]
                if taken[job]:
                    continue
                s_job = _route_free(hop_ptr, hop_link, free, job, t)
                picked[count] = item
                count += 1
                if best < 0 or s_job < best_s - EPS:
                    best, best_s = count - 1, s_job
                if s_job <= t:
                    break
            for other in range(count):
                if other != best:
                    q_size[link] = _queue_push(q_store, base, q_size[link], picked[other])
            i, s = job_at[picked[best]], best_s
        members[0] = i
        num_members = 1
        if coalesce:
            by_first[head_id[i]] = -1
            size = msg_size[i]
            # enough chunks that α is alpha_share of the message, no more (bigger ones slow the pipeline)
            # (clamped before int(): a float past int64 does not convert)
            most = min(max_coalesce, max(size, int(min(route_alpha[i] / alpha_share * route_rate[i] / chunk_bytes,
                                                       max_coalesce))))
            nxt = by_first[next_id[i]] if next_id[i] >= 0 else -1
            if has_drain:
                left_now = np.inf
                for h in range(hop_ptr[i], hop_ptr[i + 1]):
                    if left[hop_link[h]] < left_now:
                        left_now = left[hop_link[h]]
                most = max(size, int(min(left_now * drain / (1 + drain) * route_rate[i] / chunk_bytes, most)))
            while nxt >= 0 and not taken[nxt] and size + msg_size[nxt] <= most:
                taken[nxt] = True
                members[num_members] = nxt
                num_members += 1
                size += msg_size[nxt]
                by_first[head_id[nxt]] = -1
                nxt = by_first[next_id[nxt]] if next_id[nxt] >= 0 else -1
            finish = s + route_alpha[i] * math.ceil(size / max_step_chunks) + size * chunk_bytes / route_rate[i]
        else:
            finish = s + duration[i]
        taken[i] = True
        if has_drain:
            moved = 0.0
            for k in range(num_members):
                moved += data_time[members[k]]
            for h in range(hop_ptr[i], hop_ptr[i + 1]):
                free[hop_link[h]] = finish
                left[hop_link[h]] -= moved
        else:
            for h in range(hop_ptr[i], hop_ptr[i + 1]):
                free[hop_link[h]] = finish
        events = _event_push(ev_t, ev_k, ev_i, events, finish, 1, link)
        for k in range(num_members):
            m = members[k]
            start[m] = s
            end[m] = finish
            for d in range(dnt_ptr[m], dnt_ptr[m + 1]):
                j = dnt_idx[d]
                waiting[j] -= 1
                if waiting[j] == 0:   # ready when the last of its inputs has arrived
                    ready = end[dep_idx[dep_ptr[j]]]
                    for e in range(dep_ptr[j] + 1, dep_ptr[j + 1]):
                        if end[dep_idx[e]] > ready:
                            ready = end[dep_idx[e]]
                    events = _event_push(ev_t, ev_k, ev_i, events, ready, 0, j)
        for k in range(1, num_members):
            head[members[k]] = i
    unplaced = 0
    for i in range(n):
        if waiting[i] > 0:
            unplaced += 1
    return start, end, head, unplaced
