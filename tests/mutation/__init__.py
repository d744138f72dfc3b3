"""A small mutation run for the core modules (``tox -e mutation``; README, Development).

``python -m tests.mutation [GROUP ...]`` mutates each module of a group (see
:data:`tests.mutation.runner.TARGETS`) one change at a time and runs that
group's own unit tests against every mutant; a mutant the tests do not notice
*survives*. The score is killed / (mutants - listed equivalents).
"""
