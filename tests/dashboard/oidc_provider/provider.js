// A real OpenID Connect provider (the `oidc-provider` package) on 127.0.0.1 for
// tests/dashboard/test_oidc.py.
//
// The handshake, over stdio, one JSON line each way:
//   1. it listens on a free port and prints {"issuer": "http://127.0.0.1:<port>"};
//   2. it reads {"client": {...}, "accounts": {"<login>": {<claims>}}} from stdin (the
//      client's redirect_uris name the dashboard, whose port is known only once its app is
//      built with this issuer);
//   3. it prints {"ready": true} and serves until stdin closes.
// The development login form accepts any login name; that name is the account id, and
// its claims are the ones the test gave for it (none but `sub` for a name it did not).
import http from 'node:http';
import readline from 'node:readline';

import Provider from 'oidc-provider';

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
  const input = readline.createInterface({ input: process.stdin });
  input.on('close', () => process.exit(0));
  input.once('line', (line) => {
    const { client, accounts } = JSON.parse(line);
    const provider = new Provider(issuer, {
      clients: [client],
      // scopes beyond the standard ones, each carrying its claim
      claims: {
        openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'],
        groups: ['groups'], tenant: ['tenant'],
      },
      scopes: ['openid', 'email', 'profile', 'groups', 'tenant'],
      features: { devInteractions: { enabled: true } },
      cookies: { keys: ['servelens-test-cookie-key'] },
      async findAccount(ctx, id) {
        return {
          accountId: id,
          async claims() { return { sub: id, ...(accounts[id] || {}) }; },
        };
      },
    });
    server.on('request', provider.callback());
    process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  });
});
