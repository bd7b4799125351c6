"""Who may do what (SPEC 9): passwords, the one credential store for users and tokens
(API and collector tokens alike), and the audit log. The dashboard's request checks are in
dashboard.access; the collector asks credentials.Credentials for its tokens."""
