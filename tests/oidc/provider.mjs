// A real OAuth 2.1 authorization server for the tests (npm oidc-provider, pinned in package-lock.json).
// Usage: node provider.mjs PORT RESOURCE CLIENT_ID CLIENT_SECRET FORMAT
// The issuer is http://127.0.0.1:PORT (no trailing slash). Client-credentials tokens for RESOURCE are
// RS256 JWTs (FORMAT "jwt") or opaque (FORMAT "opaque", for introspection at /token/introspection)
// whose aud is RESOURCE (resource indicators); scopes "read" and "deploy" may be granted. The same
// client may introspect and revoke them.
import Provider from "oidc-provider";

const [port, resource, clientId, clientSecret, format] = process.argv.slice(2);
const scopes = "read deploy";
const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [
    {
      client_id: clientId,
      client_secret: clientSecret,
      grant_types: ["client_credentials"],
      redirect_uris: [],
      response_types: [],
      scope: scopes,
    },
  ],
  scopes: scopes.split(" "),
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: true, allowedPolicy: () => true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resource,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator) => {
        if (indicator !== resource) throw new Error(`unknown resource ${indicator}`);
        return { scope: scopes, audience: resource, accessTokenFormat: format, accessTokenTTL: 600, jwt: { sign: { alg: "RS256" } } };
      },
    },
  },
});
provider.listen(Number(port), "127.0.0.1", () => console.log(`authorization server ready on ${port}`));
