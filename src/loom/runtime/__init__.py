"""Runtime drivers and servers: the same policy objects as the simulators, acting on real
processes, sockets and tensors."""
