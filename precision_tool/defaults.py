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
# compare / check / baseline (docs/compare.md)
COMPARE_CHUNK_ELEMENTS = 1 << 20  # values read per chunk of a tensor: memory stays a few chunks
COMPARE_JOBS = 2  # `compare --jobs`: threads scoring tensor pairs (1.6-1.85x on two cores, bench/bench_compare.py)
# Threads only pay when pairs are large: below this many values per pair on average the pool's hand-offs
# cost more than the GIL-free kernel saves (a 64-step transformer pair: 6.9 s with 2 threads, 4.2 s with one)
COMPARE_POOL_MIN_ELEMENTS = 1 << 16
BASELINE_COSINE_DROP_ABS = 1e-6  # `check --baseline`: cosine may drop by max(this, ...
BASELINE_COSINE_DROP_REL = 0.1  # ... this share of the baseline's distance to 1, 1 - cosine)
BASELINE_ERROR_GROWTH_REL = 0.1  # max_abs_err (or stats |norm diff|) may grow by 10 % ...
BASELINE_ERROR_GROWTH_ABS = 1e-12  # ... plus this

# Diagnosis (analysis/): relative L2 errors against golden.
SIGNIFICANT_ERROR = 1e-2  # an op introducing less than 1 % relative error is never the culprit
INTRODUCED_EXCESS = 8.0  # introduced > this x what the compute dtype explains: the kernel, not the dtype
FUSION_SUSPECT_RATIO = 4.0  # fused error > this x the unfused op's error in the fusion-off run

OPTIMIZERS = ("sgd", "momentum", "adam")  # the training session's optimizers (`collect --optimizer`)

MAX_SCHEDULE = 2147483647  # Rec SDK init's bound on max_steps, train_steps, eval_steps and save_steps

# Zoom (analysis/zoom.py): full tensors of the divergent region only, after a statistics pass
ZOOM_OPS_BEFORE = 3  # ops executed before the divergent one (same step) whose tensors the region also records
