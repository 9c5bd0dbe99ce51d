// A real OAuth 2.1 authorization server for the tests (npm oidc-provider, pinned in package-lock.json).
// Usage: node provider.mjs PORT RESOURCE CLIENT_ID CLIENT_SECRET
// The issuer is http://127.0.0.1:PORT (no trailing slash). Client-credentials tokens for RESOURCE are
// RS256 JWTs whose aud is RESOURCE (resource indicators); scopes "read" and "deploy" may be granted.
import Provider from "oidc-provider";

const [port, resource, clientId, clientSecret] = process.argv.slice(2);
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
    introspection: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resource,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator) => {
        if (indicator !== resource) throw new Error(`unknown resource ${indicator}`);
        return { scope: scopes, audience: resource, accessTokenFormat: "jwt", accessTokenTTL: 600, jwt: { sign: { alg: "RS256" } } };
      },
    },
  },
});
provider.listen(Number(port), "127.0.0.1", () => console.log(`authorization server ready on ${port}`));
