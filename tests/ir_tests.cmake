# golden and error-corpus IR tests (filled below)
