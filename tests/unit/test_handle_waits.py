"""HandleTable's waits (csrc/core/handle_table.h): a waiter spins for the spin window, then
sleeps; completions that land before, inside, at the end of and after the window each end the
wait, none is lost (a lost wake-up would be rescued by the watchdog and counted), and a wait
that sleeps is woken."""

import pytest
from cpp_testing import load_testing_module

T = load_testing_module()


@pytest.mark.parametrize("spin_us", [0, 20, 50])
def test_every_wait_ends_with_its_completion(spin_us):
    # delays up to 3x the window (at least 100 us): completions inside, at the edge and after it
    out = T.wait_against_completer(rounds=3000, spin_us=spin_us,
                                   max_delay_us=max(100, 3 * spin_us))
    assert out == {"completed": 3000, "rescued": 0, "left": 0}


def test_a_long_wait_sleeps_and_is_woken():
    out = T.wait_against_completer(rounds=20, spin_us=10, max_delay_us=20000)
    assert out == {"completed": 20, "rescued": 0, "left": 0}


def test_handle_ids_wrap_past_int_max_onto_1_never_0_and_skip_held_ids():
    """Ids are positive ints: after 2^31 - 1 operations they wrap to 1, never to 0 (the
    reducer's and the adapter's "no handle") or a negative id, and skip an id still held."""
    top = 2**31 - 1
    assert T.handle_ids_from(top - 1, 4) == [top - 1, top, 1, 2]
    assert T.handle_ids_from(top, 4, held=[1, 3]) == [top, 2, 4, 5]
    assert T.handle_ids_from(0, 2) == [1, 2]
    assert T.handle_ids_from(-5, 1) == [1]
