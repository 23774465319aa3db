"""The GPU check (issue 47): one run on a CUDA machine that measures everything the issue asks,
writes every figure as one JSON file, and runs the same way on the CPU (`--device cpu --quick`)
so its plumbing is tested where there is no GPU. `scripts/gpu-prepare` builds what it carries,
`scripts/gpu-check` installs that and runs `python -m workers.tools.gpu_check`."""
