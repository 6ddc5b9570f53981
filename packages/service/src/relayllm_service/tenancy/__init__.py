"""Who may use the service and how much: projects and their keys, quotas, fair share, failed
sign-ins, the usage ledger.
"""
