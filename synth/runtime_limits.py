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
