"""The learner's live dashboard: a read-only web view of the run and the swarm.

- :mod:`learner.web.state`: snapshots of the learner's live objects (pure functions over them;
  they never call anything that changes the learner's state).
- :mod:`learner.web.svg`: charts drawn server-side as SVG (no JavaScript library, works offline).
- :mod:`learner.web.page`: HTML of the page's sections, shared with ``swarm-learner report``.
- :mod:`learner.web.app`: the Starlette app: the page, a JSON API, server-sent events, ``/metrics``.
- :mod:`learner.web.server`: serves the app with Hypercorn's trio worker inside the learner's nursery.
"""
