"""What the attention kernels run on, apart from the kernels themselves: launch plans and the
bounded caches (``launch``), TMA descriptors (``tma``), the tuning decisions kept on disk
(``tuning_cache``) and shared through Triton's cache manager (``tuning_store``), and the Triton
runtime quirks (``triton_compat``, the only module of ``kernels/`` that touches Triton's private
names)."""
