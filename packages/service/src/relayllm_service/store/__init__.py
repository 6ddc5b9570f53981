"""The job store (batches, file records, runners' claims) and the files' bytes: used by the
gateway and the runner alike.
"""
