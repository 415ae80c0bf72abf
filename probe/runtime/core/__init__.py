"""The pure core: the contract, the trip rule, evidence, the loop detector, sampling, stream
reassembly and the sidecar document. Standard library only; no I/O but the sidecar's writes."""
