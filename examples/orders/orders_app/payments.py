"""A stand-in for a payment provider: authorises a card token, or declines it.

The endpoint authorises the payment after it wrote the order, the run and the
work item and before it commits, so a declined payment shows what a failure
at that point does: the transaction rolls back and none of the three is left.
Tokens follow the habit of payment providers' test cards: ``tok_visa`` is
authorised, ``tok_declined`` is not.
"""

from __future__ import annotations

#: The token this stand-in declines (not a secret: a provider's test card).
DECLINED = "tok_declined"


class PaymentDeclinedError(Exception):
    """The provider refused the payment."""


def authorise(token: str, *, customer: str, amount: int) -> str:
    """An authorisation id for ``amount`` (cents), or :class:`PaymentDeclinedError`."""
    if token == DECLINED or amount <= 0:
        raise PaymentDeclinedError(f"the card of {customer!r} was declined")
    return f"auth-{customer}-{amount}"
