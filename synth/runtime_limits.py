"""The MSCCL runtime limits: the one home of the structural checks a program must pass to load.

From msccl-executor-nccl (``msccl_struct.h``, ``msccl_parser.cc``) as summarised in ``docs/programs.md``
(runtime limits). Methods plan within them (``synth.synthesis``), the lowering splits connections and
spreads peers to meet them (``synth.program.lower``), and the exporter checks them before writing XML
(``synth.program.msccl_xml``). Plain constants with no imports, so every stage may use them.
"""

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
