"""Weights on the move: tensors <-> bytes, chunked transfer, same-host /dev/shm snapshots, the one fetch
state machine workers and env actors share, and the bounded-mode pull rule."""
