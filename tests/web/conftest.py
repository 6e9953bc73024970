from web_fixtures import learner_objects  # noqa: F401  (fixture)
