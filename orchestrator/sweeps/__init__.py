"""What a sweep needs beyond running trials: proposals (`search`), stopping (`schedulers`, with the
loss-curve-collapse maths in `collapse`), collapse references (`references`), and reading a
finished sweep back (`curves`, `summary`, `plots`, `audit`)."""
