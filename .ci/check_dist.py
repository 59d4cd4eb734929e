"""Checks what `python -m build` made: the wheel and the source archive.

    python .ci/check_dist.py DIST_DIR

The wheel must hold the jt_dist package and its metadata, nothing else; the
source archive must hold every file git tracks under the folders its suites,
examples, benchmarks and docs need (MANIFEST.in). Exits 1, naming what is
wrong, otherwise.
"""

import glob
import os
import subprocess
import sys
import tarfile
import zipfile

# What the source archive must carry besides the package.
_SDIST_FOLDERS = ("jt_dist", "tests", "tests_multigpu", "examples",
                  "benchmarks", "docs")
_SDIST_FILES = ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md",
                "CONTRIBUTING.md", "mkdocs.yml", "BUILD", "WORKSPACE",
                "conftest.py", ".ci/run", ".ci/check_dist.py")


def _one(pattern: str) -> str:
  found = glob.glob(pattern)
  if len(found) != 1:
    sys.exit(f"check_dist: expected one file matching {pattern}, found"
             f" {found}")
  return found[0]


def check_wheel(path: str) -> list[str]:
  names = zipfile.ZipFile(path).namelist()
  problems = [f"wheel holds {name}, outside jt_dist/ and its metadata"
              for name in names
              if not name.startswith(("jt_dist/", "jt_dist-"))
              or (name.startswith("jt_dist-") and ".dist-info/" not in name)]
  tracked = _tracked(("jt_dist",))
  problems += [f"wheel lacks {name}" for name in tracked
               if name.endswith(".py") and name not in names]
  if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
    problems.append("wheel lacks the LICENSE")
  # Pure Python: one wheel for every platform and Python from 3.11 on.
  if not os.path.basename(path).endswith("-py3-none-any.whl"):
    problems.append(f"wheel {os.path.basename(path)} is not tagged"
                    " py3-none-any (jt_dist has no compiled part)")
  return problems


def check_sdist(path: str) -> list[str]:
  with tarfile.open(path) as archive:
    names = {name.split("/", 1)[1] for name in archive.getnames()
             if "/" in name}
  wanted = _tracked(_SDIST_FOLDERS) + list(_SDIST_FILES)
  problems = [f"source archive lacks {name}" for name in wanted
              if name not in names]
  problems += [f"source archive holds {name}" for name in names
               if "__pycache__" in name or name.endswith(".pyc")]
  return problems


def _tracked(folders) -> list[str]:
  out = subprocess.run(["git", "ls-files", "--", *folders],
                       capture_output=True, text=True, check=True).stdout
  return out.split()


def main() -> None:
  dist = sys.argv[1]
  problems = (check_wheel(_one(os.path.join(dist, "jt_dist-*.whl")))
              + check_sdist(_one(os.path.join(dist, "jt_dist-*.tar.gz"))))
  for problem in problems:
    print(f"check_dist: {problem}")
  if problems:
    sys.exit(1)
  print(f"check_dist: the wheel and the source archive in {dist} hold what"
        " they should")


if __name__ == "__main__":
  main()
