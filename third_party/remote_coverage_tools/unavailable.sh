#!/bin/sh
echo "coverage tools are not available in Ferry's offline build" >&2
exit 1
