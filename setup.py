"""The compiled parts of tidemark: the Debezium JSON event writer
(``tidemark.serde._render``), MariaDB's row-image decoder
(``tidemark.source.mariadb._row_image``), PostgreSQL's pgoutput row messages to JSON
lines (``tidemark.source.postgres._pgoutput_line``) and its replication messages out of
libpq's buffer (``tidemark.source.postgres._copy_data``).

Optional: where they cannot be built (no C compiler), tidemark uses the same code in
Python, which is what the C code is tested against.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tidemark.serde._render",
            ["src/tidemark/serde/_render.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "tidemark.source.mariadb._row_image",
            ["src/tidemark/source/mariadb/_row_image.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "tidemark.source.postgres._copy_data",
            ["src/tidemark/source/postgres/_copy_data.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "tidemark.source.postgres._pgoutput_line",
            ["src/tidemark/source/postgres/_pgoutput_line.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
