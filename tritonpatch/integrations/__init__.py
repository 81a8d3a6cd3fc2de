"""Bridges from other libraries to tritonpatch's attention kernels. Each integration is a subpackage
that imports its library only when it is used, so importing tritonpatch never needs it installed."""
