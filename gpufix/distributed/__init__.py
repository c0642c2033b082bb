"""Multi-rank jobs: what gpufix adds to a distributed job and reads back from it.

`flight` turns PyTorch's flight recorder on (ring buffer, dump on timeout into the run record)
and reads the per-rank dumps safely; `flight_match` lines the ranks up the way PyTorch's own
fr_trace does and says which rank never entered a collective or called a different one, as
`# gpufix-flight:` lines for the rules (rules/distributed/DST045, DST046). Neither imports torch.
"""
