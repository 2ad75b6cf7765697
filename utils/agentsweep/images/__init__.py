"""Container images: references, their registry digests, the lock that pins them, and the digest of the
copy a node runs (docs/first-run.md, "Images pinned by digest")."""
