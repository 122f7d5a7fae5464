#!/bin/bash
printf '#!/bin/sh\necho "Hello, ${1:-world}!"\n' > /app/greet
chmod +x /app/greet
