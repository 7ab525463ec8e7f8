-- The fixed SQL script behind the Debezium reference events (tests/reference/debezium-*/)
-- and tests/test_debezium_conformance.py, which runs it again and captures it with tidemark.
--
-- Format (read by tidemark.testing.debezium_reference.load_script): a statement ends with
-- ';' at the end of a line; '--' lines are comments. The part before '-- @stream' runs
-- before the capture starts (its rows are the initial snapshot); the part after runs once
-- the snapshot has been delivered, each statement in its own transaction (autocommit),
-- except between 'BEGIN;' and 'COMMIT;'. The last statement, a non-transactional logical
-- decoding message with prefix 'reference-end' (non-transactional, so that no transaction
-- END record follows it), tells the capture that the script is done.
--
-- Changing this file means regenerating the references: scripts/debezium_reference.py.

CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');

-- Every common type. DEFAULT replica identity: updates carry no before image, deletes
-- only the key.
CREATE TABLE types (
    id int PRIMARY KEY,
    i2 smallint, i4 integer, i8 bigint,
    n_10_2 numeric(10, 2), n_5 numeric(5), n_any numeric,
    f4 real, f8 double precision,
    b boolean,
    t text, vc varchar(16), ch char(4),
    d date, tm time, tm3 time(3), ttz timetz,
    ts timestamp, ts3 timestamp(3), tstz timestamptz, tstz3 timestamptz(3),
    iv interval,
    u uuid, j json, jb jsonb, by bytea,
    a_int int[], a_text text[], a_bool boolean[],
    m mood
);

-- Small tables whose rows exist before the capture starts: the initial snapshot.
CREATE TABLE snap_a (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE snap_b (code varchar(8) PRIMARY KEY, qty int);

-- NOT NULL columns with and without a DEFAULT, and nullable ones with a DEFAULT: what a
-- delete's key-only before image and an explicit NULL come out as.
CREATE TABLE nn (
    id int PRIMARY KEY,
    label text NOT NULL, qty int NOT NULL, flag boolean NOT NULL,
    amount numeric(8, 2) NOT NULL, at timestamptz NOT NULL,
    status text NOT NULL DEFAULT 'new',
    note text DEFAULT 'none', n int DEFAULT 7
);

-- Values stored out of line (TOAST), left unchanged by an UPDATE of another column.
CREATE TABLE toast (
    id int PRIMARY KEY, n int,
    big_text text, big_bytea bytea, big_jsonb jsonb, big_text_arr text[], big_int_arr int[]
);
ALTER TABLE toast ALTER COLUMN big_text SET STORAGE EXTERNAL;
ALTER TABLE toast ALTER COLUMN big_bytea SET STORAGE EXTERNAL;
ALTER TABLE toast ALTER COLUMN big_jsonb SET STORAGE EXTERNAL;
ALTER TABLE toast ALTER COLUMN big_text_arr SET STORAGE EXTERNAL;
ALTER TABLE toast ALTER COLUMN big_int_arr SET STORAGE EXTERNAL;

-- REPLICA IDENTITY FULL: updates and deletes carry the whole old row.
CREATE TABLE full_t (id int PRIMARY KEY, v text, n int, big text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
ALTER TABLE full_t ALTER COLUMN big SET STORAGE EXTERNAL;

INSERT INTO snap_a VALUES (1, 'one'), (2, 'two');
INSERT INTO snap_b VALUES ('x', 10), ('y', NULL);
INSERT INTO types VALUES (
    1, -32768, 2147483647, 9223372036854775807,
    12345678.91, 42, 3.14159,
    1.5, 2.25,
    true,
    'hello "world"', 'varchar', 'ab',
    '2024-02-29', '13:45:30.123456', '13:45:30.123', '13:45:30.5+02',
    '2024-02-29 13:45:30.123456', '2024-02-29 13:45:30.123',
    '2024-02-29 13:45:30.123456+02', '2024-02-29 13:45:30.1+00',
    '1 year 2 mons 3 days 04:05:06.78',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}',
    '\xdeadbeef',
    '{1,2,NULL}', '{"x","y z",NULL}', '{t,f}',
    'happy'
);

-- @stream

-- Inserts: ordinary values, edge values, special values, and NULLs.
INSERT INTO types VALUES (
    2, 32767, -2147483648, -9223372036854775808,
    -0.01, -99999, 1.500,
    0.1, 123456789.125,
    false,
    E'h\u00e9llo \u2603 tab\there\nnew line \\ back', '', 'a',
    '1969-12-31', '00:00:00', '23:59:59.999', '23:59:59.999999-08',
    '1969-12-31 23:59:59.999999', '1970-01-01 00:00:00',
    '1970-01-01 00:00:00+00', '2000-01-01 00:00:00.5-05:30',
    '-1 mon 2 days -00:00:01',
    '00000000-0000-0000-0000-000000000000', '[]', '{}',
    '\x',
    '{}', '{}', '{}',
    'sad'
);
INSERT INTO types (id, i4, n_any, f4, f8, d, ts, ts3, tstz, tstz3, iv, ttz)
    VALUES (3, 0, 100, 'NaN', 'Infinity', 'infinity', 'infinity', '-infinity',
            '-infinity', 'infinity', '0', '00:00:00+00');
INSERT INTO types (id, f4, f8, n_any) VALUES (4, '-Infinity', 1e-5, 0.000000123);
INSERT INTO types (id, f4, f8, n_any) VALUES (5, 1e10, 1e300, -12345678901234567890.123);
INSERT INTO types (id) VALUES (6);

-- Update and delete under DEFAULT replica identity.
UPDATE types SET i4 = 7, t = 'updated' WHERE id = 2;
DELETE FROM types WHERE id = 3;

-- A primary-key change: delete (and its tombstone) of the old key, create of the new.
UPDATE snap_a SET id = 10 WHERE id = 1;
DELETE FROM snap_b WHERE code = 'x';

-- NOT NULL columns missing from a delete's before image; explicit NULLs in columns
-- that have a DEFAULT.
INSERT INTO nn (id, label, qty, flag, amount, at, note, n)
    VALUES (1, 'a', 5, true, 1.50, '2024-01-01 00:00:00+00', NULL, NULL);
INSERT INTO nn (id, label, qty, flag, amount, at) VALUES (2, 'b', 6, false, 2.50, '2024-01-02 00:00:00+00');
DELETE FROM nn WHERE id = 1;

-- TOASTed values, then an UPDATE that leaves them unchanged.
INSERT INTO toast VALUES (
    1, 1, repeat('x', 3000), decode(repeat('ab', 3000), 'hex'), to_jsonb(repeat('j', 3000)),
    array_fill('z'::text, ARRAY[1000]), array_fill(7, ARRAY[1000])
);
UPDATE toast SET n = 2 WHERE id = 1;
DELETE FROM toast WHERE id = 1;

-- REPLICA IDENTITY FULL: update (with a TOASTed value left unchanged), key change, delete.
INSERT INTO full_t VALUES (1, 'a', 1, repeat('y', 3000));
UPDATE full_t SET v = 'b' WHERE id = 1;
UPDATE full_t SET id = 2 WHERE id = 1;
DELETE FROM full_t WHERE id = 2;

-- Logical decoding messages: transactional, non-transactional, and inside a transaction
-- with changes to two tables.
SELECT pg_logical_emit_message(true, 'audit', 'transactional body');
SELECT pg_logical_emit_message(false, 'audit', 'non-transactional body');
BEGIN;
INSERT INTO snap_a VALUES (3, 'three');
INSERT INTO snap_b VALUES ('z', 30);
SELECT pg_logical_emit_message(true, 'audit', 'inside a transaction');
INSERT INTO snap_a VALUES (4, 'four');
UPDATE snap_b SET qty = 31 WHERE code = 'z';
COMMIT;

-- TRUNCATE of one table, then of two in one statement.
TRUNCATE snap_b;
TRUNCATE snap_a, nn;

SELECT pg_logical_emit_message(false, 'reference-end', 'end of script');
