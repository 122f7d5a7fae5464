"""Generated from proto/ by gyre.codegen; do not edit."""
