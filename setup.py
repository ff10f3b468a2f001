"""Maps the card's top-level folders to ``framegraph.<folder>`` (see pyproject.toml for metadata).

``framegraph`` itself is a namespace package, so nothing generic such as ``models`` lands at the top
of site-packages. Subpackages are found by walking each folder, so a new ``kernels/<op>/`` needs no
edit here.
"""
from setuptools import find_packages, setup

FOLDERS = ["stream", "models", "kernels", "renderers", "apps", "assets"]

packages, package_dir = [], {}
for folder in FOLDERS:
    packages.append(f"framegraph.{folder}")
    package_dir[f"framegraph.{folder}"] = folder
    packages += [f"framegraph.{folder}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "framegraph.assets": ["**/*"],
        "framegraph.apps": ["web/*", "*.md"],
        "framegraph.apps.pipecat": ["web/*", "web/src/*"],
    },
)
