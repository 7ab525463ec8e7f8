"""The compiled part of tidemark: the Debezium JSON event writer (``tidemark.serde._render``).

Optional: where it cannot be built (no C compiler), tidemark uses the same writer in
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
        )
    ]
)
