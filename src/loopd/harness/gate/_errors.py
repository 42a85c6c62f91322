"""Gate errors (a branch of the harness tree; see `loopd.harness._errors`).

HarnessError
└── GateError                       the gate could not do what was asked; callers fail closed (deny)
    ├── RuleStoreError              the stored rules could not be read or written
    │   ├── RulePersistenceError    storing "always" grants failed; the store is unchanged, nothing is granted
    │   └── RuleStoreCorruptError   the stored rules could not be decoded; deny until the file is repaired
    └── GatePolicyError             a headless policy file is missing, unreadable or invalid
"""

from __future__ import annotations

from loopd.harness._errors import HarnessError


class GateError(HarnessError):
    """The gate could not do what was asked; callers fail closed (deny)."""


class RuleStoreError(GateError):
    """The rule store could not be read or written."""


class RulePersistenceError(RuleStoreError):
    """Rules could not be stored. The store is unchanged and no grant may be minted."""


class RuleStoreCorruptError(RuleStoreError):
    """The stored rules could not be decoded."""


class GatePolicyError(GateError):
    """A headless policy file is invalid."""
