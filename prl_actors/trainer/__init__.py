"""The Trainer process: consumes the buffer's stream in arrival order, one published version per epoch."""
