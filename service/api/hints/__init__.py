"""What a request says about its session: Tenure's own hints, other projects' dialects, and the
prefix digests a session no key names is inferred from."""
