"""`install_deps`: the exact install sequence for a model on a MindSpeed-MM version and CPU architecture.

`plan.py` turns registry data into verified argv steps, `conflicts.py` finds pins that cannot share one
environment, `script.py` renders the plan as bash, `execute.py` runs it and `deps.py` is the tool's entry.
Kept import-free so `pipeline.py` can reuse the planner without loading the executor.
"""
