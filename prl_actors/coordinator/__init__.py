"""The Coordinator process: epochs, membership, assignment of groups to workers, evaluation."""
