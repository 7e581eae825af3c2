from setuptools import find_packages, setup

setup(
    name="bwfabric",
    version="0.1.0",
    description="OpenFlow/SDN controller suite for predictable tenant bandwidth "
                "(LESSOR, BG/WC priority queues, LRC) on os-ken, Mininet and Open vSwitch",
    python_requires=">=3.11",
    packages=find_packages(include=["bwfabric*", "controller*", "apps*", "mininet_topos*",
                                    "experiments*", "hostagent*"]),
    install_requires=[line.strip() for line in open("requirements.txt")
                      if line.strip() and not line.startswith("#")
                      and not line.startswith(("pytest", "hypothesis"))],
    entry_points={"console_scripts": ["bwfabric=bwfabric.cli:main"]},
)
