"""The actor runtime every process shares: a pure `Core` per role hosted by a pykka actor fed by a ZeroMQ
`Port`, and the parts every core has (dispatch, lifecycle, requests, refusals, membership client, faults)."""
