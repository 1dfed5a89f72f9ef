"""The InferenceWorker process: holds one weight version, pulls work for it, generates and scores groups."""
