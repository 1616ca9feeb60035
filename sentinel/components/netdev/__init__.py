"""Plain network interfaces (``/sys/class/net/*/statistics``): the traffic of jobs that run over TCP sockets
(gloo, NCCL's socket transport), read like the IB ports and judged by the link-pace rule."""
