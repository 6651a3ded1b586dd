import pytest

from units_lightning.schedules import Constant, LinearAnneal, LinearWarmup


def test_paper_lambda_schedule():
    lam = LinearAnneal(0.99, 0.5, 50)
    assert lam(0) == 0.99
    assert lam(10) == pytest.approx(0.99 - 0.49 * 0.2)
    assert lam(50) == lam(99) == pytest.approx(0.5)


@pytest.mark.parametrize("peak", [8.0, 2.0, 0.5], ids=["omniglot", "cifarfs", "mini-imagenet-1shot"])
def test_paper_eta_schedule_is_min_p_p_e_over_10(peak):
    eta = LinearWarmup(peak, 10)
    for epoch in range(0, 30):
        assert eta(epoch) == pytest.approx(min(peak, peak * epoch / 10))


def test_schedules_accept_fractional_epochs_and_reject_bad_lengths():
    assert LinearWarmup(2.0, 10)(2.5) == pytest.approx(0.5)
    assert Constant(0.3)(1e9) == 0.3
    with pytest.raises(ValueError):
        LinearAnneal(epochs=0)
    with pytest.raises(ValueError):
        LinearWarmup(epochs=-1)
    assert "LinearAnneal(start=0.99" in repr(LinearAnneal())
