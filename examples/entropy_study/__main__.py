"""`python -m examples.entropy_study`: lists the two studies (each is its own command)."""

print(__import__("examples.entropy_study", fromlist=["__doc__"]).__doc__)
