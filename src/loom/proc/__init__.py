"""Process lifetimes: nothing Loom starts outlives the process that started it.

Two mechanisms, one rule (a pipe whose only writer is the parent; its end-of-file is the
parent's death, by any signal, SIGKILL included — `PR_SET_PDEATHSIG` would fire when the
forking *thread* ends, and reaches only the direct child):

* `lifeline`: a Python child of Loom's own (a worker rank, a sidecar) watches the pipe itself
  and exits;
* `tether`: a foreign program's process tree (vLLM: the API server, the engine core and its
  workers) gets a small watcher in its process group that ends the whole group.

And what a killed group leaves behind does not outlive it either: `shm` removes the shared
memory it mapped once the group is gone.
"""
