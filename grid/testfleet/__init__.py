"""The logical multi-machine fixture behind `gridctl test start|status|watch|stop`.

One NATS server (secured), one controller, one gateway and N host agents on this machine, each
agent a real process with its own host id, failure domain, grid home, credential (obtained
through the real invite/join flow), capacity share, engine port range and llama.cpp children.
With network namespaces every logical host also has its own address, and its engines are
unreachable from outside it. Everything runs detached; a state file under the grid home names
every process and network object, so `stop` removes exactly those.
"""
