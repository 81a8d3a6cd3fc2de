"""What the attention kernels run on, apart from the kernels themselves: launch plans and the
bounded caches (``launch``), TMA descriptors (``tma``), the on-disk tuning decisions
(``tuning_cache``) and the Triton runtime quirks (``triton_compat``, the only module of
``kernels/`` that touches Triton's private names)."""
