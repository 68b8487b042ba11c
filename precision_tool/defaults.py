"""Named defaults shared by the library and both front ends."""

COSINE_THRESHOLD = 0.98  # `vcs -c` / `compare -c`: an op is flagged at or below this
LIST_LIMIT = 10  # `vcs -l` / `compare -l`
CHECK_MIN_COSINE = 0.99  # `check --min-cosine`
CP_PRINT = 20  # `cp -p`
CP_ATOL = 1e-3  # `cp -al`
CP_RTOL = 1e-3  # `cp -rl`
PT_PRINT = 16  # `pt -p`
OVERFLOW_LIMIT = 10  # `of -l`
SEED = 0
STEPS = 20
OVERFLOW_MODE = "saturation"  # Atlas training products support saturation only
NPU_PRECISION_MODE = "allow_fp32_to_fp16"  # TF adapter default on Atlas training products
