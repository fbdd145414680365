"""Row streams read from files: the paper's real matrices in the formats they are published in.

The paper's experiments (App. G) stream the first rows of UCI tables (Rice (Cammeo and Osmancik),
Skin Segmentation), standardised, and of SuiteSparse's Landmark matrix. Supported formats, by
file suffix, each read by the library the field uses for it:

- `.csv`, `.tsv`, `.txt`, `.data`: a delimited table (pandas; delimiter detected, a header line
  detected when its fields are not numbers). UCI's Skin_NonSkin.txt is one.
- `.arff`: Weka's attribute-relation format (scipy.io.arff), in which UCI ships Rice.
- `.mtx`: Matrix Market (scipy.io), SuiteSparse's format (landmark.mtx).
- `.npy`: a 2-D NumPy array.

By default every numeric column is a coordinate and text columns (a class label) are dropped;
`columns` picks columns by name or 0-based index instead (Skin's label column is numeric: pick
`0,1,2`). Only the first `n` rows are read into the stream.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

SUFFIXES = {".csv": "table", ".tsv": "table", ".txt": "table", ".data": "table", ".arff": "arff", ".mtx": "mtx",
            ".npy": "npy"}
WHERE = ("the paper's tables: UCI Rice (Cammeo and Osmancik), https://archive.ics.uci.edu/dataset/545 "
         "(Rice_Cammeo_Osmancik.arff); UCI Skin Segmentation, https://archive.ics.uci.edu/dataset/229 "
         "(Skin_NonSkin.txt, columns 0,1,2); SuiteSparse Landmark, https://sparse.tamu.edu/Pajek/Landmark (landmark.mtx)")


class DataError(ValueError):
    """A data file that cannot be streamed, with what to change."""


def check_format(data_path: str) -> str:
    """The format of `data_path` by its suffix, or a DataError naming the supported ones."""
    if not data_path:
        raise DataError(f"stream='file' needs data_path: a table of rows ({', '.join(SUFFIXES)}); {WHERE}")
    kind = SUFFIXES.get(Path(data_path).suffix.lower())
    if kind is None:
        raise DataError(f"data_path={data_path!r}: unknown format {Path(data_path).suffix!r}; "
                        f"supported: {', '.join(SUFFIXES)}")
    return kind


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_table(path: Path, nrows: int | None):
    import pandas as pd

    with open(path, newline="") as f:
        head = [line for _, line in zip(range(5), f) if line.strip()]
    if not head:
        raise DataError(f"data_path={str(path)!r} is empty")
    try:
        sep = csv.Sniffer().sniff("".join(head), delimiters=",;\t ").delimiter
    except csv.Error:
        sep = ","
    fields = [f for f in head[0].strip().split(sep) if f != ""] if sep != " " else head[0].split()
    header = None if all(_is_number(f.strip().strip('"')) for f in fields) else 0
    kwargs = {"sep": r"\s+"} if sep in (" ", "\t") else {"sep": sep}
    return pd.read_csv(path, header=header, nrows=nrows, **kwargs)


def _read_frame(path: Path, kind: str, nrows: int | None):
    """A pandas DataFrame of the file's first `nrows` rows (all when None)."""
    import pandas as pd

    if kind == "table":
        return _read_table(path, nrows)
    if kind == "arff":
        from scipy.io import arff

        records, _ = arff.loadarff(str(path))
        frame = pd.DataFrame(records[:nrows] if nrows else records)
        return frame
    if kind == "mtx":
        from scipy import io, sparse

        m = io.mmread(str(path))
        m = sparse.csr_matrix(m)[:nrows] if sparse.issparse(m) else np.asarray(m)[:nrows]
        return pd.DataFrame(m.toarray() if sparse.issparse(m) else m)
    array = np.load(path, mmap_mode="r")
    if array.ndim != 2:
        raise DataError(f"data_path={str(path)!r} holds a {array.ndim}-D array; a row stream is 2-D [rows, columns]")
    return pd.DataFrame(np.asarray(array[:nrows] if nrows else array))


def _select(frame, columns: str, path: Path):
    """The numeric columns to stream: `columns` by name or index, else every numeric one."""
    if not columns:
        numeric = frame.select_dtypes(include=[np.number])
        if numeric.shape[1] == 0:
            raise DataError(f"data_path={str(path)!r} has no numeric column")
        return numeric
    picked = []
    for token in (c.strip() for c in columns.split(",")):
        if token in map(str, frame.columns):
            picked.append(next(c for c in frame.columns if str(c) == token))
        elif token.isdigit() and int(token) < frame.shape[1]:
            picked.append(frame.columns[int(token)])
        else:
            raise DataError(f"columns: {token!r} is neither a column name nor an index below {frame.shape[1]} of "
                            f"{str(path)!r} (its columns: {', '.join(map(str, frame.columns))})")
    chosen = frame[picked]
    from pandas.api.types import is_numeric_dtype

    bad = [str(c) for c in chosen.columns if not is_numeric_dtype(chosen[c])]
    if bad:
        raise DataError(f"columns: {', '.join(bad)} of {str(path)!r} are not numeric: leave them out of columns")
    return chosen


def table_shape(data_path: str, columns: str = "") -> tuple[int, int]:
    """(rows, streamed columns) of the file, for the checks before a run."""
    kind = check_format(data_path)
    path = Path(data_path).expanduser()
    if not path.is_file():
        raise DataError(f"data_path={data_path!r} does not exist (relative paths are read from the folder the "
                        f"run starts in); {WHERE}")
    if kind in ("mtx", "npy"):  # the header says it, without reading the matrix
        if kind == "mtx":
            from scipy.io import mminfo

            rows, cols = mminfo(str(path))[:2]
        else:
            shape = np.load(path, mmap_mode="r").shape
            if len(shape) != 2:
                raise DataError(f"data_path={data_path!r} holds a {len(shape)}-D array; a row stream is 2-D [rows, columns]")
            rows, cols = shape
        if not columns:
            return int(rows), int(cols)
        import pandas as pd

        return int(rows), _select(pd.DataFrame(np.zeros((1, cols))), columns, path).shape[1]
    frame = _select(_read_frame(path, kind, None), columns, path)
    return frame.shape[0], frame.shape[1]


def read_rows(data_path: str, n: int, columns: str = "", standardize: bool = False) -> torch.Tensor:
    """The first `n` rows of the file as a float64 [n, d] stream; with `standardize`, each column
    centred and scaled to unit variance over those rows (a constant column is only centred)."""
    kind = check_format(data_path)
    path = Path(data_path).expanduser()
    frame = _select(_read_frame(path, kind, n), columns, path)
    if frame.shape[0] < n:
        raise DataError(f"data_path={data_path!r} has {frame.shape[0]} rows, fewer than n={n}: set n={frame.shape[0]}")
    rows = torch.from_numpy(frame.to_numpy(dtype=np.float64, copy=True))
    if not torch.isfinite(rows).all():
        raise DataError(f"data_path={data_path!r} has missing or non-finite values in the streamed columns")
    if standardize:
        std = rows.std(dim=0, unbiased=False)
        rows = (rows - rows.mean(dim=0)) / torch.where(std > 0, std, torch.ones_like(std))
    return rows
