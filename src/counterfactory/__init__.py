"""CounterFactory: counterfactual image-text data for probing and repairing vision-language models.

The package holds all logic; the Snakemake workflow calls its command-line interface
(``counterfactory <subcommand>``), so every step also runs without Snakemake.
"""

__version__ = "0.1.0"
