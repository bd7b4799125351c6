-- Access (SPEC 9): the users added with `servelens users add`, the API and collector tokens
-- of `servelens tokens create`, the key that signs the dashboard's session cookies, and the
-- audit log. Users and tokens are versioned rows: the newest version of a name or token id
-- is the one in force (a revocation, a removed user or a new password is a newer row).
CREATE TABLE IF NOT EXISTS auth_users (
    name String,
    password_hash String,                -- argon2id
    role LowCardinality(String),         -- admin | viewer | tenant
    tenants Array(String),
    removed UInt8,
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY name;

CREATE TABLE IF NOT EXISTS auth_tokens (
    token_id String,                     -- the public part of the token, shown in listings
    secret_sha256 String,                -- hex SHA-256 of the whole token; the token itself is never stored
    name String,
    role LowCardinality(String),         -- admin | viewer | tenant | ingest
    tenants Array(String),
    created_by String,
    created_at DateTime64(3, 'UTC'),
    expires_at Nullable(DateTime64(3, 'UTC')),
    revoked_at Nullable(DateTime64(3, 'UTC')),
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY token_id;

-- Signed-in sessions: the cookie holds a random id, the store only its SHA-256. Signing out
-- (or an admin removing the user) ends it server-side: a copied cookie stops working too.
CREATE TABLE IF NOT EXISTS auth_sessions (
    session_sha256 String,
    user String,
    source LowCardinality(String),       -- password (role from the user as it is now) | oidc (role below)
    role LowCardinality(String),         -- oidc: the role its claims mapped to at sign-in
    tenants Array(String),
    created_at DateTime64(3, 'UTC'),
    expires_at DateTime64(3, 'UTC'),
    ended_at Nullable(DateTime64(3, 'UTC')),
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY session_sha256
TTL toDate(expires_at) + toIntervalDay(1);

-- One row per secret name; the first written wins (argMin on created_at), so processes
-- that create it at the same moment agree on one.
CREATE TABLE IF NOT EXISTS auth_secrets (
    name String,
    value String,
    created_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree
ORDER BY (name, created_at);

CREATE TABLE IF NOT EXISTS audit_log (
    time DateTime64(3, 'UTC'),
    actor String,                        -- user name, token id, or '' (anonymous)
    action LowCardinality(String),       -- sign_in | sign_in_failed | sign_out | token_created | ...
    target String,
    outcome LowCardinality(String),      -- ok | refused
    remote String,                       -- client address
    detail String
) ENGINE = MergeTree
ORDER BY time
TTL toDate(time) + toIntervalDay(400);
