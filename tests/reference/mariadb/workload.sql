-- The SQL workload behind tests/reference/mariadb/debezium-3.6.3.jsonl (Debezium's own
-- events, written by scripts/debezium_reference_mariadb.py) and
-- tests/test_mariadb_conformance.py, which runs it again and captures it with tidemark.
--
-- Format (tidemark.testing.debezium_reference_mariadb.load_workload): a statement ends
-- with ';' at the end of a line; '--' lines are comments. The part before '-- @stream'
-- runs before the capture starts (its rows are the initial snapshot); the part after runs
-- once the snapshot has been delivered, on one connection, each statement in its own
-- transaction (autocommit) except between 'BEGIN;' and 'COMMIT;'. The last statement, an
-- insert into reference_end, tells the capture that the workload is done.
--
-- The first two statements are ALL_TYPES and ROW_1 of tests/test_mariadb_capture.py
-- (the conformance test checks that they still are).
--
-- Keep it small: Debezium's MySQL connector on MariaDB stalls on bulk streams.
-- Changing this file means regenerating the reference: scripts/debezium_reference_mariadb.py.

CREATE TABLE everything (
    id INT PRIMARY KEY,
    ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT,
    mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
    f FLOAT, d DOUBLE, dec1 DECIMAL(10,2), dec2 DECIMAL(30,10), dec3 DECIMAL(5,0),
    b1 BIT(1), b9 BIT(9), y YEAR, dt DATE, tm TIME(3), tm0 TIME, dtm DATETIME(6),
    dtm0 DATETIME, ts TIMESTAMP(2) NULL, c CHAR(5), vc VARCHAR(300), tx TEXT,
    bn BINARY(4), vb VARBINARY(10), bl BLOB, e ENUM('a','b','c'), s SET('x','y','z'),
    j JSON, lat VARCHAR(10) CHARACTER SET latin1);
INSERT INTO everything VALUES (1, -128, 255, -32768, 65535, -8388608, 16777215,
    -2147483648, 4294967295, -9223372036854775808, 18446744073709551615, 1.1, 2.2,
    -12.34, -123456789012345678.9012345678, 99999, b'1', b'100000001', 2024,
    '2024-02-29', '-838:59:59.123', '12:00:00', '2024-01-02 03:04:05.678901',
    '1999-12-31 23:59:59', '2024-06-01 12:00:00.5', 'ab', REPEAT('x', 300), 'héllo',
    'ab', x'00ff', x'deadbeef', 'b', 'x,z', '{"a": 1}', 'café');
-- A row of NULLs.
INSERT INTO everything (id) VALUES (2);

-- A pre-filled table (the snapshot), with a nullable column that has a DEFAULT.
CREATE TABLE customers (
    id INT PRIMARY KEY, name VARCHAR(50) NOT NULL, balance DECIMAL(10,2),
    tier VARCHAR(10) DEFAULT 'basic');
INSERT INTO customers VALUES (1, 'alice', 10.00, 'gold'), (2, 'bob', 20.50, NULL),
    (3, 'carol', 0.00, 'basic');

-- @stream

-- The all-types row and the row of NULLs again, streamed; then an update (both images of
-- every type) and a delete.
INSERT INTO everything VALUES (3, -128, 255, -32768, 65535, -8388608, 16777215,
    -2147483648, 4294967295, -9223372036854775808, 18446744073709551615, 1.1, 2.2,
    -12.34, -123456789012345678.9012345678, 99999, b'1', b'100000001', 2024,
    '2024-02-29', '-838:59:59.123', '12:00:00', '2024-01-02 03:04:05.678901',
    '1999-12-31 23:59:59', '2024-06-01 12:00:00.5', 'ab', REPEAT('x', 300), 'héllo',
    'ab', x'00ff', x'deadbeef', 'b', 'x,z', '{"a": 1}', 'café');
INSERT INTO everything (id) VALUES (4);
UPDATE everything SET vc = 'short', dec1 = 1.5, b1 = b'0', tm0 = '-00:00:01' WHERE id = 3;
DELETE FROM everything WHERE id = 3;

-- Inserts, a two-row update, a delete.
INSERT INTO customers VALUES (4, 'dave', 1.25, NULL);
UPDATE customers SET balance = balance + 1 WHERE id IN (1, 2);
DELETE FROM customers WHERE id = 3;

-- A primary-key change.
UPDATE customers SET id = 10 WHERE id = 4;

-- A table created mid-stream, and a transaction over two tables.
CREATE TABLE orders (
    order_id INT PRIMARY KEY AUTO_INCREMENT, customer_id INT NOT NULL,
    amount DECIMAL(8,2) NOT NULL, note VARCHAR(20) DEFAULT 'none');
BEGIN;
INSERT INTO orders (customer_id, amount) VALUES (1, 9.99), (2, 5.00);
UPDATE customers SET balance = balance - 9.99 WHERE id = 1;
INSERT INTO orders (customer_id, amount, note) VALUES (10, 0.01, NULL);
COMMIT;

-- A composite key, declared in another order than the columns.
CREATE TABLE line_items (
    order_id INT, line SMALLINT, sku VARCHAR(10), qty INT,
    PRIMARY KEY (line, order_id));
INSERT INTO line_items VALUES (1, 1, 'A-1', 2), (1, 2, 'B-7', 1), (2, 1, 'A-1', 5);
UPDATE line_items SET qty = 3 WHERE order_id = 1 AND line = 1;
DELETE FROM line_items WHERE order_id = 2;

-- A table without a primary key.
CREATE TABLE notes (n INT, body VARCHAR(20));
INSERT INTO notes VALUES (1, 'one'), (2, 'two');
DELETE FROM notes WHERE n = 1;

-- ALTER TABLE ADD COLUMN mid-stream: later events carry the new column.
ALTER TABLE customers ADD COLUMN email VARCHAR(40) DEFAULT 'n/a';
INSERT INTO customers (id, name, balance) VALUES (5, 'erin', 3.00);
UPDATE customers SET email = 'bob@example.com' WHERE id = 2;

-- TRUNCATE.
TRUNCATE TABLE orders;

-- The end of the workload.
CREATE TABLE reference_end (id INT PRIMARY KEY);
INSERT INTO reference_end VALUES (1);
