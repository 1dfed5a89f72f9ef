"""The WeightPublisher process: stores the newest weight version and serves it to workers."""
