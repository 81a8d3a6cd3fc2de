"""torch.compile(flex_attention) with a score_mod mask, patched by environment variables alone:
bitwise equal to the unpatched program (forward output and q/k/v gradients), and the passes did
rewrite its forward and backward kernels. Each run is a fresh process with empty caches of its
own (Inductor's and Triton's), so nothing compiled unpatched is reused."""
from __future__ import annotations

import pytest

from flex_score_mod_run import differing, run_flex_score_mod

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seq", [1024, 1000])
def test_flex_score_mod_is_bitwise_equal_with_the_passes(tmp_path, seq):
    plain = run_flex_score_mod(str(tmp_path / "plain"), False, seq)
    patched = run_flex_score_mod(str(tmp_path / "patched"), True, seq)
    assert plain["reports"] == []
    if differing(plain, patched):
        # A second unpatched run tells a pass defect (plain reproducible, patched different) from an
        # unpatched program that does not give the same bits twice.
        again = run_flex_score_mod(str(tmp_path / "plain_again"), False, seq)
        pytest.fail(f"patched differs from unpatched in {differing(plain, patched)}; a second unpatched run "
                    f"differs from the first in {differing(plain, again) or 'nothing'} and from the patched run "
                    f"in {differing(again, patched) or 'nothing'}")
    versioned = {kernel for _, kernel, counts, kept in patched["reports"] if kept and counts.get("loops_versioned")}
    backward = {kernel for kernel in versioned if "backward" in kernel}
    assert backward and versioned - backward, patched["reports"]          # forward and backward templates
