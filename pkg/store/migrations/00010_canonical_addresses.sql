-- +goose Up

-- Server addresses are kept in one canonical form, so that every spelling
-- of a host ("::ffff:192.0.2.1" and "192.0.2.1", "fd00:5ec:0:0::2" and
-- "fd00:5ec::2") finds the same server, the same pinned host key and the
-- same run lock. The rules are those of store.CanonicalAddress in Go (a test
-- checks that both agree):
--   IPv4: dotted decimal; IPv4-mapped IPv6: unmapped to IPv4;
--   IPv6: RFC 5952 (lower case, longest zero run compressed);
--   host names: lower case, no trailing dot, last label not a number.
-- It returns NULL for anything else: zones, prefixes, ports, white space,
-- IPv4-compatible IPv6 (::a.b.c.d), IPv4 with leading zeros, "10.1".
-- +goose StatementBegin
CREATE FUNCTION autoprov_canonical_address(a text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    ip inet;
    h  text;
BEGIN
    IF a ~ '^[0-9]+(\.[0-9]+){3}$' OR position(':' IN a) > 0 THEN
        -- Postgres reads leading zeros in IPv4 ("010.1.1.1" as 10.1.1.1);
        -- Go does not: refuse them, as Go does.
        IF a ~ '(^|\.)0[0-9]' AND position(':' IN a) = 0 THEN
            RETURN NULL;
        END IF;
        BEGIN
            ip := a::inet;
        EXCEPTION WHEN others THEN
            RETURN NULL;
        END;
        IF position('/' IN a) > 0 THEN
            RETURN NULL;
        END IF;
        IF family(ip) = 6 AND ip <<= '::ffff:0.0.0.0/96'::inet THEN
            RETURN host('0.0.0.0'::inet + (ip - '::ffff:0.0.0.0'::inet));
        END IF;
        IF family(ip) = 6 AND ip <<= '::/96'::inet AND ip NOT IN ('::'::inet, '::1'::inet) THEN
            RETURN NULL;
        END IF;
        RETURN host(ip);
    END IF;
    h := lower(a);
    IF right(h, 1) = '.' THEN
        h := left(h, -1);
    END IF;
    IF length(h) > 253
       OR h !~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$'
       OR h ~ '(^|\.)([0-9]+|0x[0-9a-f]*)$' THEN
        RETURN NULL;
    END IF;
    RETURN h;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION autoprov_canonicalize_address() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    c text;
BEGIN
    c := autoprov_canonical_address(NEW.address);
    IF c IS NULL THEN
        RAISE EXCEPTION '%.address %: not an IP address or host name in an accepted form', TG_TABLE_NAME, quote_literal(NEW.address)
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.address := c;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(quote_literal(handle) || ' (' || quote_literal(address) || ')', ', ' ORDER BY handle)
      INTO bad FROM servers WHERE autoprov_canonical_address(address) IS NULL;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'servers with an address that is neither an IP address nor a host name: %; correct them, then start again', bad;
    END IF;
    SELECT string_agg(quote_literal(address), ', ' ORDER BY address)
      INTO bad FROM host_keys WHERE autoprov_canonical_address(address) IS NULL;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'host_keys with an address that is neither an IP address nor a host name: %; delete them, then start again', bad;
    END IF;
END;
$$;
-- +goose StatementEnd

UPDATE servers SET address = autoprov_canonical_address(address)
 WHERE address <> autoprov_canonical_address(address);

-- Pins of one host under several spellings: the first pinned stands (trust
-- on first use), the others go.
DELETE FROM host_keys h
 USING host_keys o
 WHERE autoprov_canonical_address(h.address) = autoprov_canonical_address(o.address)
   AND h.ssh_port = o.ssh_port
   AND (h.pinned_at, h.address) > (o.pinned_at, o.address);
UPDATE host_keys SET address = autoprov_canonical_address(address)
 WHERE address <> autoprov_canonical_address(address);

CREATE TRIGGER servers_address BEFORE INSERT OR UPDATE OF address ON servers
    FOR EACH ROW EXECUTE FUNCTION autoprov_canonicalize_address();
CREATE TRIGGER host_keys_address BEFORE INSERT OR UPDATE OF address ON host_keys
    FOR EACH ROW EXECUTE FUNCTION autoprov_canonicalize_address();

-- The trigger writes the canonical form; the check refuses any other, also
-- from writers that bypass triggers (session_replication_role = replica).
ALTER TABLE servers ADD CONSTRAINT servers_address_canonical
    CHECK (autoprov_canonical_address(address) IS NOT DISTINCT FROM address);
ALTER TABLE host_keys ADD CONSTRAINT host_keys_address_canonical
    CHECK (autoprov_canonical_address(address) IS NOT DISTINCT FROM address);

-- +goose Down
ALTER TABLE host_keys DROP CONSTRAINT host_keys_address_canonical;
ALTER TABLE servers DROP CONSTRAINT servers_address_canonical;
DROP TRIGGER host_keys_address ON host_keys;
DROP TRIGGER servers_address ON servers;
DROP FUNCTION autoprov_canonicalize_address();
DROP FUNCTION autoprov_canonical_address(text);
