// A real OAuth 2.1 authorization server for the tests (npm oidc-provider, pinned in package-lock.json).
// Usage: node provider.mjs PORT RESOURCE CLIENT_ID CLIENT_SECRET FORMAT [EXCHANGE_TTL_S]
// The issuer is http://127.0.0.1:PORT (no trailing slash). Client-credentials tokens for RESOURCE are
// RS256 JWTs (FORMAT "jwt") or opaque (FORMAT "opaque", for introspection at /token/introspection)
// whose aud is RESOURCE (resource indicators); scopes "read" and "deploy" may be granted. The same
// client may introspect and revoke them.
//
// With EXCHANGE_TTL_S, CLIENT_ID may also use RFC 8693 token exchange: it presents a subject_token (a
// JWT this server issued for RESOURCE) and a `resource` (any URL: the upstream), and gets an RS256 JWT
// access token whose `sub` is the subject token's, `aud` the resource, `act.sub` CLIENT_ID, lasting
// EXCHANGE_TTL_S seconds; client-credentials tokens are then issued for any resource (the upstream's
// too, for the gateway's calls with no caller). Three more clients with the same secret act as callers: "caller-a",
// "caller-b" and "refused-caller", whose tokens the exchange refuses (invalid_grant).
import Provider, { errors } from "oidc-provider";
import { createRemoteJWKSet, jwtVerify } from "jose"; // oidc-provider's own dependency

const [port, resource, clientId, clientSecret, format, exchangeTtl] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const scopes = "read deploy";
const TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token";
const callers = exchangeTtl ? ["caller-a", "caller-b", "refused-caller"] : [];
const client = (id, grants) => ({
  client_id: id,
  client_secret: clientSecret,
  grant_types: grants,
  redirect_uris: [],
  response_types: [],
  scope: scopes,
});
const exchangedSubject = new WeakMap(); // exchanged token -> the subject it acts for

const provider = new Provider(issuer, {
  clients: [
    client(clientId, exchangeTtl ? ["client_credentials", TOKEN_EXCHANGE] : ["client_credentials"]),
    ...callers.map((id) => client(id, ["client_credentials"])),
  ],
  scopes: scopes.split(" "),
  formats: {
    customizers: {
      jwt: (ctx, token, jwt) => {
        const subject = exchangedSubject.get(token);
        if (subject) Object.assign(jwt.payload, { sub: subject, act: { sub: token.clientId } });
      },
    },
  },
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
        // Exchanging, the gateway's own client-credentials tokens are for the upstream's URL too.
        if (indicator !== resource && !exchangeTtl) throw new Error(`unknown resource ${indicator}`);
        return { scope: scopes, audience: indicator, accessTokenFormat: format, accessTokenTTL: 600, jwt: { sign: { alg: "RS256" } } };
      },
    },
  },
});

if (exchangeTtl) {
  const keys = createRemoteJWKSet(new URL(`${issuer}/jwks`));
  provider.registerGrantType(
    TOKEN_EXCHANGE,
    async (ctx) => {
      const { subject_token: subjectToken, subject_token_type: subjectType, requested_token_type: wanted } = ctx.oidc.params;
      const target = ctx.oidc.params.resource || ctx.oidc.params.audience;
      if (!subjectToken || subjectType !== ACCESS_TOKEN_TYPE) throw new errors.InvalidRequest("subject_token of type access_token required");
      if (wanted && wanted !== ACCESS_TOKEN_TYPE) throw new errors.InvalidRequest("only access tokens are issued");
      if (!target) throw new errors.InvalidTarget("resource or audience required");
      let claims;
      try {
        ({ payload: claims } = await jwtVerify(subjectToken, keys, { issuer, audience: resource }));
      } catch (error) {
        throw new errors.InvalidGrant(`subject_token: ${error.message}`);
      }
      if (claims.sub === "refused-caller") throw new errors.InvalidGrant("this subject may not be acted for");
      const requested = (ctx.oidc.params.scope || "").split(" ").filter(Boolean);
      const token = new provider.ClientCredentials({ client: ctx.oidc.client, scope: requested.join(" ") || undefined });
      token.resourceServer = new provider.ResourceServer(target, {
        scope: scopes, audience: target, accessTokenFormat: "jwt", accessTokenTTL: Number(exchangeTtl), jwt: { sign: { alg: "RS256" } },
      });
      exchangedSubject.set(token, claims.sub);
      const value = await token.save();
      ctx.body = {
        access_token: value,
        issued_token_type: ACCESS_TOKEN_TYPE,
        token_type: "Bearer",
        expires_in: token.expiration,
        scope: token.scope,
      };
    },
    ["subject_token", "subject_token_type", "requested_token_type", "audience", "resource", "scope"],
  );
}

provider.listen(Number(port), "127.0.0.1", () => console.log(`authorization server ready on ${port}`));
