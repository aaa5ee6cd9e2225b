"""The MSCCL runtime limits: the one home of the structural checks a program must pass to load.

Two runtimes load synth's XML (docs/programs.md, "Runtimes"): Azure/msccl-executor-nccl (the maintained
executor; RCCL shares it) and microsoft/msccl (the original NCCL fork). Their limits differ, so each has a
frozen :class:`RuntimeProfile`; the module constants below are the executor's, which the methods plan within
(``synth.synthesis``), the lowering meets (``synth.program.lower``) and the exporter checks by default
(``synth.program.msccl_xml``). Every value cites the runtime source it is read from (commit c6f6b36 of the
executor, b23e9cd of microsoft/msccl). Only the standard library is imported, so every stage may use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.errors import SynthError

MAX_CHANNELS = 32          # MAXCHANNELS
MAX_STEPS_PER_TB = 64      # MSCCL_MAX_NUM_STEPS: steps per threadblock
MAX_STEP_CHUNKS = 71       # MSCCL_MAX_COUNT = 72: a step's cnt must be < 72
MAX_TB_PER_CHANNEL = 32    # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL (send peers, and receive peers, per channel)
MAX_THREADBLOCKS = 1024    # MSCCL_MAX_NUM_THREAD_BLOCKS = 32 per channel x 32 channels
MAX_DEPENDED_TB = 127      # dependentBid is stored in an int8
MAX_XML_NODES = 4096       # parser node pool per rank: the algo, the gpus, this rank's threadblocks and steps
MAX_OFFSET = 32767         # mscclTransmission srcOffset/dstOffset are int16_t: 32768 wraps to -32768
MAX_RANKS = 32767          # mscclThreadBlock sendPeer/recvPeer are int16_t
PROTOCOLS = ("Simple", "LL", "LL128")   # mscclProtocolStrToId
NTHREADS_MULTIPLE = 32     # microsoft/msccl: an nthreads attribute must be a multiple of the warp size
# Collectives (the XML ``coll`` spellings, canonicalised) at least one runtime loads: the executor's list
# (msccl_parser.cc) and the original's (reduce_scatter, custom); gather/scatter load only in the executor.
RUNTIME_COLLECTIVES = frozenset({"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce",
                                 "gather", "scatter", "send", "recv", "alltoallv", "custom"})
# Not runtime limits: caps the XML reader applies before anything is sized from an attribute, so that a
# huge value is a clear error instead of a MemoryError in the verifier or simulator.
MAX_PARSE_BUFFER_CHUNKS = 1 << 20      # i_chunks / o_chunks / s_chunks / cnt of one gpu or step
MAX_PARSE_TOTAL_CHUNKS = 1 << 24       # all gpus' buffers together


def parse_capped(value: int, cap: int, what: str, where: str) -> int:
    """``value`` if at most ``cap`` (the program readers' caps above): checked before anything is sized from it, so
    a huge one is a clear error."""
    if value > cap:
        raise SynthError(f"{where}: {what}={value} exceeds the reader's cap of {cap}; not a program synth can "
                         "check (the MSCCL runtimes could not run it either)")
    return value


@dataclass(frozen=True)
class RuntimeProfile:
    """What one MSCCL runtime reads from an ``<algo>`` file, how it picks one for a call, and its limits.

    ``coll_spellings`` maps synth's collective names to the ``coll`` value the runtime's parser compares
    with ``strcmp`` (a collective absent from it does not load). ``reads`` lists every attribute the parser
    reads without a default, as ``(tag, attribute, line of parser_file)`` (a file lacking one is refused: the
    accessor fails on a missing attribute); ``required`` is its ``<algo>`` part. ``attributes`` is the set synth writes,
    in order (``root`` is added for rooted collectives: neither runtime reads it). ``max_bytes_unbounded`` is
    the ``maxBytes`` value that means "no upper limit" (None: there is none), ``max_bytes_inclusive`` whether
    a call of ``nBytes == maxBytes`` is selected (executor ``<=``, microsoft/msccl ``<``), and
    ``max_bytes_absent`` the value a missing ``maxBytes`` takes (None: the attribute is required).
    """

    name: str                       # the CLI's --runtime value
    repo: str                       # where the cited source lives
    parser: str                     # the function that reads <algo> (file:line at the commit read)
    coll_spellings: tuple[tuple[str, str], ...]
    parser_file: str                # the file ``reads`` cites
    reads: tuple[tuple[str, str, int], ...]
    attributes: tuple[str, ...]
    max_bytes_unbounded: int | None
    max_bytes_inclusive: bool
    max_bytes_absent: int | None
    max_steps_per_tb: int
    max_threadblocks: int
    max_files: int                  # programs one process loads (the rest are ignored)
    load_env: str                   # how files are handed to the runtime
    # microsoft/msccl: i_chunks x (N for allgather) and o_chunks x (N for reduce_scatter) must equal
    # nchunksperloop where they are > 0
    loop_chunks_match: bool
    # microsoft/msccl allocates maxBytes x s_chunks / nchunksperloop bytes of scratch when the communicator
    # is created; the executor sizes scratch from each call's nBytes
    scratch_from_max_bytes: bool
    max_channels: int = MAX_CHANNELS
    max_tb_per_channel: int = MAX_TB_PER_CHANNEL
    max_step_chunks: int = MAX_STEP_CHUNKS
    max_offset: int = MAX_OFFSET
    max_depended_tb: int = MAX_DEPENDED_TB
    max_xml_nodes: int = MAX_XML_NODES
    max_attributes: int = 16        # MAX_ATTR_COUNT: the parser ignores attributes past the 16th

    @property
    def required(self) -> tuple[str, ...]:
        """The ``<algo>`` attributes the parser reads without a default."""
        return tuple(key for tag, key, _ in self.reads if tag == "algo")

    def read_at(self, tag: str, key: str) -> str:
        """Where the parser reads attribute ``key`` of ``<tag>`` (``file:line``)."""
        return next(f"{self.parser_file}:{line}" for t, k, line in self.reads if (t, k) == (tag, key))

    def coll(self, collective: str) -> str | None:
        """The ``coll`` spelling of synth's ``collective`` in this runtime, or None where it does not load."""
        return dict(self.coll_spellings).get(collective)

    def collective_of(self, spelling: str) -> str | None:
        """synth's collective for a ``coll`` value this runtime's parser accepts (exact, case-sensitive)."""
        return {v: k for k, v in self.coll_spellings}.get(spelling)



def _reads(algo: tuple[tuple[str, int], ...], below: tuple[int, ...]) -> tuple[tuple[str, str, int], ...]:
    """A parser's ``reads``: its ``<algo>`` attributes with their lines, and the lines of ``_ELEMENT_READS``."""
    elements = [(tag, key) for tag, keys in _ELEMENT_READS for key in keys]
    return (*(("algo", key, line) for key, line in algo), *((t, k, line) for (t, k), line in zip(elements, below)))


# Below <algo> both parsers read the same attributes without a default, in this order (only the loading
# rank's <gpu> subtree beyond its id, but every rank loads the file).
_ELEMENT_READS = (("gpu", ("id", "i_chunks", "o_chunks", "s_chunks")), ("tb", ("id", "recv", "send", "chan")),
                  ("step", ("s", "srcoff", "srcbuf", "dstoff", "dstbuf", "cnt", "type", "depid", "deps", "hasdep")))

EXECUTOR = RuntimeProfile(
    name="msccl-executor",
    repo="Azure/msccl-executor-nccl",
    parser="msccl_parser.cc:721 mscclGetAlgoMetaFromXmlFile",
    # msccl_parser.cc mscclGetAlgoFromXmlFile / mscclGetAlgoMetaFromXmlFile: the strcmp chain on "coll"
    # (reducescatter at lines 347 and 749)
    coll_spellings=(("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reducescatter"),
                    ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("reduce", "reduce"),
                    ("gather", "gather"), ("scatter", "scatter")),
    # mscclGetAlgoFromXmlFile (and mscclGetAlgoMetaFromXmlFile, lines 729-785, the <algo> part again) reads
    # these with mscclXmlGetAttrInt/Int64/Str, which fail when absent (msccl_parser.h:67-87); no defaults
    parser_file="msccl_parser.cc",
    reads=_reads((("nchunksperloop", 315), ("nchannels", 319), ("ngpus", 323), ("proto", 327), ("coll", 334),
                  ("minBytes", 376), ("maxBytes", 380), ("inplace", 384), ("outofplace", 388)),
                 (399, 401, 402, 403, 413, 414, 415, 416, 472, 474, 475, 476, 477, 479, 480, 481, 482, 483)),
    attributes=("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
                "minBytes", "maxBytes"),
    max_bytes_unbounded=0,          # msccl_lifecycle.cc mscclInternalSchedulerSelectAlgo line 335: maxBytes == 0 ||
    max_bytes_inclusive=True,       # ... nBytes <= maxBytes
    max_bytes_absent=None,
    max_steps_per_tb=MAX_STEPS_PER_TB,      # makefiles/common.mk:19 MSCCL_MAX_NUM_STEPS ?= 64; msccl_parser.cc:485
    max_threadblocks=MAX_THREADBLOCKS,      # msccl_struct.h:18 32 per channel x MAXCHANNELS; msccl_parser.cc:421
    max_files=1024,                 # msccl_struct.h:21 MSCCL_MAX_NUM_ALGOS (msccl_lifecycle.cc mscclInit's handles)
    load_env="MSCCL_ALGO_DIR",      # msccl_lifecycle.cc mscclInternalSchedulerInit: every file of the directory
    loop_chunks_match=False,
    scratch_from_max_bytes=False,   # msccl_setup.cc:68 nBytes x nScratchChunks / nChunksPerLoop per call
)

MSCCL = RuntimeProfile(
    name="msccl",
    repo="microsoft/msccl",
    parser="topo.cc:759 mscclGetAlgoFromXMLAndSetAlgo",
    # src/graph/topo.cc mscclGetAlgoFromXMLAndSetAlgo (line 759): the strcmp chain on "coll" (no gather,
    # scatter; reduce_scatter at line 837)
    coll_spellings=(("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reduce_scatter"),
                    ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("reduce", "reduce")),
    # topo.cc mscclGetAlgoFromXMLAndSetAlgo: xmlGetAttrStr/Int/Int64_t fail on these (src/graph/xml.h:93-113);
    # minBytes (0), maxBytes (128 MB) and nthreads (0) have defaults (lines 789-805, 856-858), outofplace is
    # never read
    parser_file="topo.cc",
    reads=_reads((("name", 771), ("ngpus", 775), ("nchunksperloop", 782), ("nchannels", 784), ("proto", 787),
                  ("coll", 823), ("inplace", 848)),
                 (877, 879, 880, 881, 895, 896, 897, 898, 959, 961, 962, 963, 964, 966, 967, 968, 969, 970)),
    attributes=("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "minBytes", "maxBytes"),
    max_bytes_unbounded=None,       # src/graph/tuning.cc:369 ncclTopoGetMSCCLAlgo: nBytes < maxBytes, no exception
    max_bytes_inclusive=False,
    max_bytes_absent=1 << 27,       # topo.cc:805 a missing maxBytes is 128 MB
    max_steps_per_tb=256,           # src/include/msccl.h:6 MSCCL_MAX_NUM_STEPS; topo.cc:972
    max_threadblocks=216,           # msccl.h:8 MSCCL_MAX_NUM_THREAD_BLOCKS (108*2, A100's SMs twice); topo.cc:903
    max_files=4,                    # msccl.h:9 MSCCL_MAX_NUM_ALGOS; topo.cc:1202 mscclGetAllAlgoFromXMLFilesAndSetInfo
    load_env="MSCCL_XML_FILES",
    loop_chunks_match=True,         # topo.cc:886 nInputChunks*inputNChunksMultiplier != nchunksPerLoop is refused
    scratch_from_max_bytes=True,    # src/init.cc:814 maxBytes * nScratchChunks / nchunksPerLoop at init
)

RUNTIMES = {profile.name: profile for profile in (EXECUTOR, MSCCL)}
DEFAULT_RUNTIME = EXECUTOR.name


def runtime_profile(name: str | RuntimeProfile | None) -> RuntimeProfile:
    """The profile called ``name`` (None: the default, msccl-executor-nccl); ValueError names the choices."""
    if isinstance(name, RuntimeProfile):
        return name
    key = (name or DEFAULT_RUNTIME).strip().lower()
    if key not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}")
    return RUNTIMES[key]
