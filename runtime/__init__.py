"""mm-agent's bundled runtime: real feature extraction, training and sampling for the Wan family.

It reads the configs and checkpoints MindSpeed-MM uses (data.json, feature_data.json, pretrain_model.json,
tools.json, the `release/` / `iter_*/mp_rank_*` layout) and runs under torchrun on NPU (torch_npu + HCCL),
GPU (CUDA + NCCL) or CPU (gloo). Installed with the `runtime` extra; nothing here is imported by the MCP
server, which starts these modules as subprocesses.
"""
