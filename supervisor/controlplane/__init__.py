"""The control plane: where desired state lives, and how a replica hears of changes.

:mod:`.store` is the interface, :mod:`.errors` how stores fail, :mod:`.factory` the store
for a URL: :mod:`.postgres` or :mod:`.sqlite` (sharing :mod:`.checks`, :mod:`.revisions`,
:mod:`.runner` and :mod:`.migrations`), or :mod:`.follower`, another replica.
:mod:`.listen` turns PostgreSQL's NOTIFY into wake-ups of the convergence loop.
"""
